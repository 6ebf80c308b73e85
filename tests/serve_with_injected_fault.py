"""``python -m solutions serve`` with one injected fault, for tests/test_server.py.

A prompt containing ``FAULT_MARKER`` makes ``Engine.add_request`` raise RuntimeError, standing in for a
bug that hits one request. Everything else is the real server, started through the real CLI.
Usage: python tests/serve_with_injected_fault.py IMPL [serve options...]   (IMPL: solutions or labs)
"""

from __future__ import annotations

import importlib
import sys

FAULT_MARKER = "<<inject a fault here>>"


def main() -> int:
    impl, argv = sys.argv[1], sys.argv[2:]
    engine_class = importlib.import_module(f"{impl}.engine.engine").Engine
    add_request = engine_class.add_request

    def faulty_add_request(self, prompt, params, request_id=None, **options):
        if isinstance(prompt, str) and FAULT_MARKER in prompt:
            raise RuntimeError("injected fault: this request's prompt carries the fault marker")
        return add_request(self, prompt, params, request_id, **options)

    engine_class.add_request = faulty_add_request
    return importlib.import_module(f"{impl}.__main__").main(["serve", *argv])


if __name__ == "__main__":
    sys.exit(main())
