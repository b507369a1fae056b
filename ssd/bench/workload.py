"""What `ssd bench serve` sends and when: the built-in prompt sets (`builtin:chat|code|math`) or a JSONL file of
requests (`load_dataset`), the arrival schedule (`schedule`: Poisson, fixed-rate or all at once, seeded), and the
goodput bounds (`parse_goodput`)."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

BUILTIN = {
    "chat": [
        "What is a good way to start learning to play the guitar?",
        "Explain the difference between weather and climate to a ten-year-old.",
        "Write a short thank-you note to a neighbour who watered my plants.",
        "Give me three ideas for a rainy Sunday afternoon.",
        "Why do cats purr?",
        "Summarise the plot of Romeo and Juliet in four sentences.",
        "How can I improve my sleep without medication?",
        "Suggest a name for a small bakery that specialises in sourdough.",
        "What should I pack for a weekend hiking trip in the mountains?",
        "Describe the taste of a ripe mango to someone who has never had one.",
        "How do I politely decline a meeting invitation?",
        "Tell me a fun fact about octopuses.",
        "What are the pros and cons of working from home?",
        "Write a haiku about the first snow of winter.",
        "How do vaccines train the immune system?",
        "Recommend a routine for a beginner who wants to start running.",
        "What is the history of the bicycle in a few sentences?",
        "Explain why the sky is blue.",
        "Give me tips for keeping a houseplant alive.",
        "Draft a two-line bio for a freelance photographer.",
        "What makes a good cup of tea?",
        "How do I explain a gap in my CV at a job interview?",
    ],
    "code": [
        "Write a Python function that reverses a linked list.",
        "Explain what a closure is in JavaScript with an example.",
        "Write a SQL query that finds the second highest salary in a table `employees`.",
        "How do I read a CSV file with pandas and drop rows with missing values?",
        "Write a bash one-liner that counts the lines of all .py files in a folder.",
        "What is the difference between a process and a thread?",
        "Implement binary search in C.",
        "Write a Python generator that yields the Fibonacci numbers.",
        "Explain Big-O notation with the example of bubble sort.",
        "Write a Rust function that returns the largest element of a slice.",
        "How does garbage collection work in Java?",
        "Write a regular expression that matches an IPv4 address.",
        "Refactor this loop into a list comprehension: for x in xs: if x > 0: out.append(x * 2)",
        "What does `git rebase -i` do?",
        "Write a Go HTTP handler that returns JSON {\"ok\": true}.",
        "Explain the difference between `==` and `is` in Python.",
        "Write a function that checks whether a string is a palindrome, ignoring case.",
        "How do I make an asynchronous HTTP request in Python?",
        "Write a Dockerfile for a small Flask app.",
        "What is a race condition and how can a mutex prevent it?",
        "Write a TypeScript interface for a user with a name, an email and an optional age.",
    ],
    "math": [
        "What is 17 times 23? Show your working.",
        "Solve for x: 3x + 7 = 22.",
        "What is the derivative of x^3 - 4x + 1?",
        "A train travels 180 km in 2.5 hours. What is its average speed?",
        "Is 221 a prime number? Explain.",
        "What is the sum of the integers from 1 to 100?",
        "Convert 0.375 to a fraction in lowest terms.",
        "What is the area of a circle with radius 4 cm?",
        "Find the greatest common divisor of 84 and 126.",
        "If a shirt costs 40 euros after a 20% discount, what was the original price?",
        "What is the probability of rolling two sixes with two dice?",
        "Integrate 2x with respect to x.",
        "How many ways can 5 books be arranged on a shelf?",
        "What is the square root of 1764?",
        "Simplify (x^2 - 9) / (x - 3).",
        "A rectangle has a perimeter of 30 and a width of 5. What is its length?",
        "What is 15% of 360?",
        "Solve the system: x + y = 10, x - y = 4.",
        "What is log base 2 of 256?",
        "Explain why the angles of a triangle add up to 180 degrees.",
        "What is the next number in the sequence 2, 6, 12, 20, 30?",
    ],
}
GOODPUT_KEYS = ("ttft", "tpot", "e2e")


def load_dataset(spec: str, num: int, seed: int) -> list[dict]:
    """`num` request items ({"prompt"} or {"messages"}, optional "max_tokens"), cycling through the set in a
    seeded shuffle. `spec`: "builtin:chat|code|math" or a JSONL file."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN:
            raise ValueError(f"unknown built-in dataset {name!r}; choose from {', '.join(BUILTIN)}")
        items = [{"prompt": p} for p in BUILTIN[name]]
    else:
        items = []
        for n, line in enumerate(Path(spec).read_text().splitlines(), 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if not isinstance(obj, dict) or not ("prompt" in obj or "messages" in obj):
                raise ValueError(f"{spec}:{n}: each line must be an object with `prompt` or `messages`")
            items.append({k: obj[k] for k in ("prompt", "messages", "max_tokens") if k in obj})
        if not items:
            raise ValueError(f"{spec}: no prompts")
    order = items[:]
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(num)]


def schedule(n: int, rate: float, seed: int, fixed: bool = False) -> list[float]:
    """Send offsets (s from the start) of `n` requests: exponential gaps of mean 1/rate from a seeded RNG
    (Poisson arrivals), constant 1/rate gaps with `fixed`, all 0 for an infinite rate. The first is at 0."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError("the request rate must be > 0 (or inf)")
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        out.append(t)
        t += 1.0 / rate if fixed else rng.expovariate(rate)
    return out


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (ms)."""
    out = {}
    for s in specs or []:
        key, _, value = s.partition(":")
        if key not in GOODPUT_KEYS or not value:
            raise ValueError(f"bad --goodput {s!r}: use KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
        out[key] = float(value)
    return out
