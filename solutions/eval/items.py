"""The course's multiple-choice items: generated here from templates whose answers a program checks, so every
answer is right by construction and the set is the course's own work (``data/eval/README.md``).

``python -m solutions.eval.items`` rewrites ``data/eval/items.jsonl``; a test checks the shipped file is what
this module writes. One item a line::

    {"id": "capitals-004", "category": "capitals", "question": "What is the capital of Japan?",
     "choices": ["Tokyo", "Abuja", "Havana", "Kathmandu"], "answer": 0}

Invariants (``validate``): ids unique, 2+ distinct non-empty choices, ``0 <= answer < len(choices)``.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..paths import DATA_DIR

ITEMS_FILE = DATA_DIR / "eval" / "items.jsonl"
SEED = 2026
CHOICES = 4


@dataclass(frozen=True)
class Item:
    id: str
    category: str
    question: str
    choices: list[str]
    answer: int


CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "China": "Beijing", "Russia": "Moscow", "the United Kingdom": "London", "Egypt": "Cairo",
    "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw", "Austria": "Vienna",
    "Hungary": "Budapest", "the Czech Republic": "Prague", "Belgium": "Brussels", "Thailand": "Bangkok",
    "South Korea": "Seoul", "Kenya": "Nairobi", "Argentina": "Buenos Aires", "Peru": "Lima",
    "Mexico": "Mexico City", "Canada": "Ottawa", "Australia": "Canberra", "India": "New Delhi",
    "Iran": "Tehran", "Iraq": "Baghdad", "Cuba": "Havana", "Chile": "Santiago", "Venezuela": "Caracas",
    "Turkey": "Ankara", "the Philippines": "Manila", "Vietnam": "Hanoi", "Saudi Arabia": "Riyadh",
    "Romania": "Bucharest", "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb",
    "Iceland": "Reykjavik", "New Zealand": "Wellington", "Nigeria": "Abuja", "Ethiopia": "Addis Ababa",
    "Morocco": "Rabat", "Pakistan": "Islamabad", "Afghanistan": "Kabul", "Nepal": "Kathmandu",
    "Bangladesh": "Dhaka", "Syria": "Damascus", "Lebanon": "Beirut", "Jordan": "Amman", "Qatar": "Doha",
    "Ghana": "Accra", "Uganda": "Kampala",
}  # fmt: skip
"""Only capitals without a dispute or a move under way (no Bern, Jakarta, Kyiv/Kiev, Amsterdam/The Hague)."""

# (question, answer): fixed facts of the units
UNIT_FACTS = [
    ("How many centimetres are in a metre?", 100), ("How many millimetres are in a centimetre?", 10),
    ("How many metres are in a kilometre?", 1000), ("How many grams are in a kilogram?", 1000),
    ("How many millilitres are in a litre?", 1000), ("How many seconds are in a minute?", 60),
    ("How many minutes are in an hour?", 60), ("How many hours are in a day?", 24),
    ("How many days are in a week?", 7), ("How many months are in a year?", 12),
    ("How many days are in a leap year?", 366), ("How many seconds are in an hour?", 3600),
    ("How many minutes are in a day?", 1440), ("How many hours are in a week?", 168),
    ("How many inches are in a foot?", 12), ("How many feet are in a yard?", 3),
    ("How many ounces are in a pound?", 16), ("How many years are in a decade?", 10),
    ("How many years are in a century?", 100), ("How many years are in a millennium?", 1000),
]  # fmt: skip
# (small unit, how many in one large unit, large unit): "How many {small} are in {n} {large}?" -> n * per
UNIT_SCALES = [
    ("centimetres", 100, "metres"), ("grams", 1000, "kilograms"), ("minutes", 60, "hours"),
    ("seconds", 60, "minutes"), ("hours", 24, "days"), ("days", 7, "weeks"), ("months", 12, "years"),
    ("metres", 1000, "kilometres"), ("inches", 12, "feet"), ("millimetres", 10, "centimetres"),
]  # fmt: skip
ANTONYMS = [
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("day", "night"),
    ("happy", "sad"), ("light", "dark"), ("full", "empty"), ("wet", "dry"), ("early", "late"),
    ("first", "last"), ("left", "right"), ("win", "lose"), ("push", "pull"), ("rich", "poor"),
    ("strong", "weak"), ("thick", "thin"), ("hard", "soft"), ("inside", "outside"), ("above", "below"),
]  # fmt: skip
IRREGULAR_PLURALS = {
    "child": "children", "mouse": "mice", "foot": "feet", "tooth": "teeth", "man": "men",
    "woman": "women", "goose": "geese", "person": "people", "ox": "oxen", "louse": "lice",
}  # fmt: skip
WORDS = [
    "apple", "river", "garden", "window", "yellow", "planet", "orange", "pencil", "school", "dog", "music",
    "table", "bridge", "summer", "cat", "flower", "engine", "number", "forest", "castle", "tree", "mountain",
]  # fmt: skip
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
]  # fmt: skip
NAMES = ["Tom", "Ann", "Bob", "Eve", "Sam", "Kim", "Max", "Zoe", "Ian", "Amy"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _item(rng: random.Random, category: str, question: str, answer: str, wrong: list[str]) -> Item:
    """An item with ``answer`` among ``CHOICES - 1`` distinct wrong choices drawn from ``wrong``,
    in a shuffled order."""
    pool = sorted({w for w in wrong if w != answer})
    choices = [answer, *rng.sample(pool, CHOICES - 1)]
    rng.shuffle(choices)
    return Item("", category, question, choices, choices.index(answer))


def _near_numbers(rng: random.Random, value: int) -> list[str]:
    """Wrong numbers a careless answer gives: off by one, by ten, digits swapped, a factor of ten."""
    near = {value + 1, value - 1, value + 2, value - 2, value + 10, value - 10, value * 10}
    near |= {int(str(value)[::-1]), value + rng.randint(3, 9), max(0, value - rng.randint(3, 9))}
    return [str(n) for n in near if n >= 0 and n != value]


def _listed(item: Item) -> str:
    """The choices as the question names them: "12, 34, 56 or 78"."""
    return ", ".join(item.choices[:-1]) + " or " + item.choices[-1]


def arithmetic(rng: random.Random) -> Iterator[Item]:
    for _ in range(25):
        a, b = rng.randint(10, 89), rng.randint(10, 89)
        yield _item(rng, "arithmetic", f"What is {a} + {b}?", str(a + b), _near_numbers(rng, a + b))
    for _ in range(20):
        a, b = rng.randint(20, 99), rng.randint(1, 19)
        yield _item(rng, "arithmetic", f"What is {a} - {b}?", str(a - b), _near_numbers(rng, a - b))
    for _ in range(25):
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        wrong = _near_numbers(rng, a * b) + [str(a + b), str(a * (b + 1)), str((a + 1) * b)]
        yield _item(rng, "arithmetic", f"What is {a} times {b}?", str(a * b), wrong)
    for _ in range(10):
        b, q = rng.randint(2, 9), rng.randint(2, 12)
        yield _item(rng, "arithmetic", f"What is {b * q} divided by {b}?", str(q), _near_numbers(rng, q))


def capitals(rng: random.Random) -> Iterator[Item]:
    cities = list(CAPITALS.values())
    for country, city in CAPITALS.items():
        yield _item(rng, "capitals", f"What is the capital of {country}?", city, cities)


def units(rng: random.Random) -> Iterator[Item]:
    for question, value in UNIT_FACTS:
        near = {value // 10, value * 10, value * 2, value + 1, value - 1, value + 10}
        wrong = [str(n) for n in near if n > 0]
        yield _item(rng, "units", question, str(value), wrong)
    for small, per, large in UNIT_SCALES:
        for n in rng.sample(range(2, 10), 3):
            value = n * per
            wrong = [str(m) for m in {value + per, value - per, n * 10, n + per, value * 10, value + 1}]
            yield _item(rng, "units", f"How many {small} are in {n} {large}?", str(value), wrong)


def words(rng: random.Random) -> Iterator[Item]:
    for a, b in ANTONYMS:
        others = [w for pair in ANTONYMS if pair != (a, b) for w in pair]
        yield _item(rng, "words", f"What is the opposite of '{a}'?", b, others)
    for word, plural in IRREGULAR_PLURALS.items():
        wrong = [word + "s", word + "es", plural + "s", word + "en", word + "ies"]
        yield _item(rng, "words", f"What is the plural of '{word}'?", plural, wrong)
    for word in WORDS:
        n = len(word)
        wrong = [str(m) for m in (n - 2, n - 1, n + 1, n + 2) if m > 0]
        yield _item(rng, "words", f"How many letters are in the word '{word}'?", str(n), wrong)
    letters = "abcdefghijklmnopqrstuvwxyz"
    for word in WORDS[:12]:
        first = word[0].upper()
        wrong = [c.upper() for c in letters if c != word[0]]
        yield _item(rng, "words", f"What is the first letter of the word '{word}'?", first, wrong)
    for i in rng.sample(range(25), 12):
        wrong = [c.upper() for c in letters if c != letters[i + 1]]
        question = f"Which letter comes right after {letters[i].upper()} in the alphabet?"
        yield _item(rng, "words", question, letters[i + 1].upper(), wrong)


def reasoning(rng: random.Random) -> Iterator[Item]:
    for i, day in enumerate(DAYS):
        yield _item(rng, "reasoning", f"If today is {day}, what day is tomorrow?", DAYS[(i + 1) % 7], DAYS)
        yield _item(rng, "reasoning", f"If today is {day}, what day was yesterday?", DAYS[i - 1], DAYS)
    for i in rng.sample(range(12), 8):
        yield _item(rng, "reasoning", f"Which month comes after {MONTHS[i]}?", MONTHS[(i + 1) % 12], MONTHS)
    for _ in range(12):
        start, step = rng.randint(1, 20), rng.randint(2, 9)
        seq = [start + k * step for k in range(4)]
        nxt = seq[-1] + step
        question = f"What number comes next: {', '.join(map(str, seq))}, ...?"
        yield _item(rng, "reasoning", question, str(nxt), _near_numbers(rng, nxt))
    for _ in range(12):
        numbers = rng.sample(range(10, 100), CHOICES)
        largest = rng.random() < 0.5
        pick = max(numbers) if largest else min(numbers)
        item = _item(rng, "reasoning", "", str(pick), [str(n) for n in numbers])
        yield replace(item, question=f"Which is the {'largest' if largest else 'smallest'}: {_listed(item)}?")
    for _ in range(12):
        a, b, c = rng.sample(NAMES, 3)  # a > b > c
        tallest = rng.random() < 0.5
        which = "tallest" if tallest else "shortest"
        question = f"{a} is taller than {b}. {b} is taller than {c}. Who is the {which}?"
        outsider = rng.choice([n for n in NAMES if n not in (a, b, c)])
        yield _item(rng, "reasoning", question, a if tallest else c, [a, b, c, outsider])
    for _ in range(10):
        a, b = rng.randint(2, 5), rng.randint(1, 4)  # "apples": never one
        question = f"Ann has {NUMBER_WORDS[a]} apples and buys {NUMBER_WORDS[b]} more. How many has she now?"
        wrong = [w for k, w in enumerate(NUMBER_WORDS) if k != a + b]
        yield _item(rng, "reasoning", question, NUMBER_WORDS[a + b], wrong)
    for _ in range(10):
        numbers = rng.sample(range(1, 60, 2), CHOICES - 1)
        even = rng.randrange(2, 60, 2)
        item = _item(rng, "reasoning", "", str(even), [str(n) for n in numbers])
        yield replace(item, question=f"Which number is even: {_listed(item)}?")


TEMPLATES: list[Callable[[random.Random], Iterator[Item]]] = [arithmetic, capitals, units, words, reasoning]


def generate() -> list[Item]:
    """Every item, numbered within its category (``{category}-{k:03d}``), each question once; the same list
    on every run."""
    rng = random.Random(SEED)
    items, counts, questions = [], {}, set()
    for template in TEMPLATES:
        for item in template(rng):
            if item.question in questions:  # a random template drew the same numbers twice
                continue
            questions.add(item.question)
            k = counts.get(item.category, 0)
            counts[item.category] = k + 1
            items.append(replace(item, id=f"{item.category}-{k:03d}"))
    validate(items)
    return items


def validate(items: list[Item]) -> None:
    """Raise ``ValueError`` naming the first item that breaks the module's invariants."""
    seen = set()
    for item in items:
        if item.id in seen:
            raise ValueError(f"item id {item.id!r} appears twice")
        seen.add(item.id)
        if not item.question:
            raise ValueError(f"item {item.id!r} has no question")
        if len(item.choices) < 2 or len(set(item.choices)) != len(item.choices) or not all(item.choices):
            raise ValueError(f"item {item.id!r} needs 2+ distinct non-empty choices, got {item.choices}")
        if not 0 <= item.answer < len(item.choices):
            raise ValueError(f"item {item.id!r}: answer {item.answer} is not an index into its choices")


def load_items(path: Path = ITEMS_FILE) -> list[Item]:
    """The items of a JSONL file, validated."""
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        record = json.loads(line)
        if set(record) != set(Item.__dataclass_fields__):
            expected = sorted(Item.__dataclass_fields__)
            raise ValueError(f"{path}:{number}: fields {sorted(record)}, expected {expected}")
        items.append(Item(**record))
    validate(items)
    return items


def dumps(items: list[Item]) -> str:
    return "".join(json.dumps(asdict(item), ensure_ascii=False) + "\n" for item in items)


if __name__ == "__main__":
    ITEMS_FILE.parent.mkdir(parents=True, exist_ok=True)
    written = generate()
    ITEMS_FILE.write_text(dumps(written))
    print(f"wrote {ITEMS_FILE}: {len(written)} items", file=sys.stderr)
