"""Write ``data/spec/prompts_templated.jsonl``: more training prompts for the EAGLE head, from templates.

The head learns from the target's answers to prompts; 120 hand-written prompts (``prompts.jsonl``) give about
20k answer tokens, too few: the head then fits those answers (top-1 agreement 0.92 on them) and generalises
poorly (0.36 on held-back answers). This script crosses a few question and task templates with topic lists
written here, keeping the three kinds (chat, code, prose) balanced, and drops any prompt that
``prompts.jsonl`` or ``heldout.jsonl`` already holds (the held-back prompts' topics are not in the lists).

    python tools/make_spec_prompts.py          # rewrite the file
    python tools/make_spec_prompts.py --check  # exit 1 if the file is not what this script writes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPEC = Path(__file__).resolve().parents[1] / "data" / "spec"
OUT = SPEC / "prompts_templated.jsonl"

CHAT = {
    "What is {}?": [
        "a volcano",
        "gravity",
        "democracy",
        "a blockchain",
        "an ecosystem",
        "the immune system",
        "a recession",
        "a neural network",
        "renewable energy",
        "a credit score",
        "the speed of light",
        "an earthquake",
        "a constitution",
        "DNA",
        "a solar eclipse",
        "compound interest",
        "a galaxy",
        "the greenhouse effect",
        "an algorithm",
        "meditation",
        "a carbon footprint",
        "the placebo effect",
        "a mortgage",
        "a tsunami",
    ],
    "How does {} work?": [
        "a microwave oven",
        "the stock market",
        "GPS",
        "a compass",
        "a solar panel",
        "a search engine",
        "the human heart",
        "a thermostat",
        "an electric car",
        "a camera",
        "a wind turbine",
        "email",
        "a washing machine",
        "the postal system",
        "a vaccine trial",
        "a credit card",
        "recycling",
        "a bicycle gear",
    ],
    "Give me a few tips for {}.": [
        "cooking rice",
        "running a first marathon",
        "keeping a journal",
        "making new friends in a new city",
        "learning to play the guitar",
        "writing a clear email",
        "travelling on a small budget",
        "staying healthy in winter",
        "organising a small kitchen",
        "taking better photos with a phone",
        "preparing for an exam",
        "waking up early",
        "giving feedback to a colleague",
        "reading more books",
        "working from home",
        "planning a birthday party",
        "negotiating a salary",
        "drinking less coffee",
    ],
    "What is the difference between {}?": [
        "a crocodile and an alligator",
        "a virus and a worm in computing",
        "speed and velocity",
        "a simile and a metaphor",
        "stocks and bonds",
        "an ocean and a sea",
        "a frog and a toad",
        "baking soda and baking powder",
        "a democracy and a republic",
        "hardware and software",
        "a hurricane and a tornado",
        "an atom and a molecule",
        "a debit card and a credit card",
        "a tortoise and a turtle",
        "a symphony and a concerto",
        "a planet and a star",
    ],
    "Why do {}?": [
        "birds migrate",
        "we dream",
        "onions make people cry",
        "stars twinkle",
        "bread dough rise",
        "people get hiccups",
        "ships float",
        "we yawn",
        "some animals hibernate",
        "metals rust",
        "dogs wag their tails",
        "we get goosebumps",
        "ice cubes float",
        "bubbles form in soda",
    ],
}

CODE = {
    "Write a Python function that {}.": [
        "returns the median of a list of numbers",
        "checks whether a number is a perfect square",
        "converts a string to title case without using title()",
        "counts the lines in a text",
        "returns the n-th triangular number",
        "finds all pairs in a list that sum to a target",
        "converts an integer to binary",
        "computes the least common multiple of two numbers",
        "returns the longest common prefix of a list of strings",
        "checks whether a list is sorted",
        "removes all whitespace from a string",
        "returns the cumulative sum of a list",
        "merges two dictionaries",
        "finds the index of the smallest element in a list",
        "computes the dot product of two vectors",
        "returns every third element of a list",
        "counts the uppercase letters in a string",
        "converts minutes to hours and minutes",
        "finds the missing number in a list from 1 to n",
        "checks whether a string contains only digits",
        "returns the distance between two points",
        "computes simple interest",
        "reverses the words in a sentence",
        "returns the first non-repeating character in a string",
        "groups words by their first letter",
        "checks whether two rectangles overlap",
        "returns the k largest numbers in a list",
        "computes the area of a circle",
        "converts a list of strings to integers",
        "pads a string to a length",
        "checks whether a year string is a valid date",
        "finds the mode of a list",
        "computes the running maximum of a list",
        "returns the product of a list of numbers",
        "zips two lists into a dictionary",
        "counts the words that start with a vowel",
        "returns the number of days between two dates",
        "checks whether a number is an Armstrong number",
        "computes the average word length of a sentence",
        "swaps the keys and values of a dictionary",
    ],
    "Write a Python class that {}.": [
        "represents a rectangle with area and perimeter methods",
        "implements a simple queue",
        "stores a to-do list",
        "represents a point in two dimensions",
        "counts how often it is called",
        "represents a library book that can be borrowed and returned",
        "implements a simple timer",
        "represents a temperature that converts between units",
        "keeps the last n values it was given",
        "represents a playing card",
    ],
    "How do I {} in Python?": [
        "read a JSON file",
        "sort a dictionary by value",
        "handle an exception",
        "write to a text file",
        "make an HTTP request",
        "remove an item from a list",
        "format a number with two decimals",
        "check if a file exists",
        "get the current date",
        "iterate over two lists at once",
        "copy a list",
        "split a string on commas",
        "create a virtual environment",
        "use a list comprehension",
        "measure how long a function takes",
        "parse command-line arguments",
    ],
    "Write a JavaScript function that {}.": [
        "returns the largest number in an array",
        "checks whether a string is empty",
        "shuffles an array",
        "counts the keys of an object",
        "converts a date to a readable string",
        "removes falsy values from an array",
    ],
    "Write a SQL query that {}.": [
        "counts the orders per customer",
        "finds the employees hired in the last year",
        "lists the products that never sold",
        "computes the average salary per department",
    ],
}

PROSE = {
    "Write a short story about {}.": [
        "a clockmaker who builds a clock that runs backwards",
        "a boy who finds a map in an old book",
        "a dog who waits at the train station every day",
        "a village that forgets how to laugh",
        "a scientist who shrinks to the size of an ant",
        "a postman who reads the letters he delivers",
        "a painter who can only paint the sea",
        "two friends lost in a snowstorm",
        "a tree that grows overnight",
        "a knight who is afraid of the dark",
        "a chef who cooks for a king",
        "a ghost who wants to be seen",
        "a robot that runs a bakery",
        "a girl who collects lost buttons",
        "a pirate who gets seasick",
        "a family moving to a new country",
        "a violin found in an attic",
        "a mountain climber near the summit",
        "an inventor whose machine makes rain",
        "a small boat in a big storm",
        "a teacher on her last day of work",
        "a city where it never stops snowing",
        "an elephant who wants to dance",
        "a girl who trains a dragon",
    ],
    "Describe {}.": [
        "a busy train station at rush hour",
        "a quiet library on a Sunday",
        "a summer evening in a garden",
        "a fishing village at dawn",
        "the inside of an old bakery",
        "a football match in the rain",
        "a snowy forest at night",
        "a crowded beach in August",
        "an empty theatre after a show",
        "a street market at night",
        "a farm in the spring",
        "a hospital waiting room",
        "a desert at noon",
        "a child's bedroom",
        "a harbour during a storm",
        "a classroom on the first day of school",
        "a wedding in a small church",
        "a mountain lake in the morning",
    ],
    "Write a short poem about {}.": [
        "the sun",
        "a river",
        "the first day of spring",
        "an old friend",
        "the city at night",
        "a cup of tea",
        "the wind",
        "a lost key",
        "the stars",
        "a grandmother's kitchen",
        "the sea in winter",
        "a small bird",
        "a long road",
        "the rain on a window",
        "a candle",
        "a new beginning",
    ],
    "Write a letter to {}.": [
        "your future self",
        "a neighbour thanking them for their help",
        "a pen pal in another country",
        "the mayor about a park that needs cleaning",
        "a grandparent about your new school",
        "a friend who moved away",
        "a company about a broken product",
        "a favourite author",
    ],
    "Write a product description for {}.": [
        "a wooden chess set",
        "a pair of running shoes",
        "a solar-powered lamp",
        "a travel backpack",
        "a handmade ceramic mug",
        "a smart alarm clock",
        "a children's picture book",
        "a folding bicycle",
        "an electric kettle",
        "a winter coat",
    ],
    "Write a short paragraph about {}.": [
        "the history of the printing press",
        "why sleep matters",
        "the life of honeybees",
        "the invention of the telephone",
        "the importance of clean water",
        "the first trip to the moon",
        "how cities grew during the industrial revolution",
        "the benefits of learning music",
        "the role of museums",
        "why people keep pets",
    ],
}


def build() -> list[dict]:
    """Every template crossed with its topics, kinds in turn, minus prompts already kept elsewhere."""
    taken = set()
    for name in ("prompts.jsonl", "heldout.jsonl"):
        taken |= {
            json.loads(line)["prompt"] for line in (SPEC / name).read_text().splitlines() if line.strip()
        }
    rows = []
    for kind, templates in (("chat", CHAT), ("code", CODE), ("prose", PROSE)):
        for template, topics in templates.items():
            rows += [{"kind": kind, "prompt": template.format(topic)} for topic in topics]
    seen = set()
    kept = []
    for row in rows:
        if row["prompt"] not in taken and row["prompt"] not in seen:
            seen.add(row["prompt"])
            kept.append(row)
    return kept


def main(argv: list[str]) -> int:
    text = "".join(json.dumps(row) + "\n" for row in build())
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not what tools/make_spec_prompts.py writes: run it")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {text.count(chr(10))} prompts to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
