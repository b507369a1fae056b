"""Training prompts, synthesised from templates with a seeded generator.

The held-out evaluation prompts (`ssd.prompts`) are never produced: `training_prompts` drops any exact match,
and the templates below are written apart from them. Kinds follow the evaluation: code, chat, math.
"""
from __future__ import annotations

import random

from ssd.prompts import PROMPTS

LANGS = ["Python", "JavaScript", "C", "C++", "Go", "Rust", "Java", "TypeScript", "Ruby", "bash", "SQL", "C#"]
CODE_TASKS = [
    "returns the n-th Fibonacci number", "merges two sorted lists", "counts the vowels in a string",
    "removes duplicates from a list", "checks whether a number is prime", "computes the factorial of n",
    "finds the largest element of an array", "reverses the words in a sentence", "parses a CSV line",
    "converts Celsius to Fahrenheit", "flattens a nested list", "computes the average of a list of numbers",
    "sorts a list of strings by length", "checks whether two strings are anagrams", "implements binary search",
    "returns the greatest common divisor of two integers", "validates an email address",
    "reads a file and counts its words", "implements a stack with push and pop", "implements a queue",
    "finds the second largest number in a list", "capitalises the first letter of every word",
    "computes the sum of the digits of an integer", "checks whether a year is a leap year",
    "converts a decimal number to binary", "finds the most frequent element in a list",
    "rotates an array by k positions", "computes the dot product of two vectors", "transposes a matrix",
    "generates all permutations of a string", "checks whether parentheses are balanced",
    "implements bubble sort", "implements quicksort", "implements merge sort", "counts words in a text",
    "removes whitespace from both ends of a string", "finds the intersection of two lists",
    "computes the power set of a set", "returns the length of the longest word", "checks for a palindrome number",
    "converts a string to title case", "computes compound interest", "finds all primes below n",
    "implements a linked list with insert and delete", "computes the median of a list",
    "shuffles a list in place", "builds a frequency table of characters", "reads JSON from a file",
    "makes an HTTP GET request and prints the status", "computes the Levenshtein distance",
    "implements a binary search tree insert", "does a breadth-first search on a graph",
    "does a depth-first search on a graph", "finds the missing number in 1..n", "swaps two variables",
    "formats a number with thousands separators", "checks whether a string contains only digits",
]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.", "In {lang}, write code that {task}.",
    "Show me a {lang} program that {task}, with comments.", "How would you write a function in {lang} that {task}?",
    "Write a short {lang} snippet that {task} and explain it.", "Implement a {lang} function that {task}. Keep it simple.",
]
CODE_QUESTIONS = [
    "What is the difference between a list and a tuple in Python?", "Explain recursion with an example.",
    "What does the 'static' keyword mean in Java?", "How does garbage collection work?",
    "What is a closure in JavaScript?", "Explain Big O notation.", "What is the difference between git merge and git rebase?",
    "What is a race condition?", "How do I read a file line by line in Python?", "What is a REST API?",
    "Explain the difference between an array and a linked list.", "What is dependency injection?",
    "What are Python decorators?", "How do I handle exceptions in Python?", "What is a pointer in C?",
    "Explain SQL joins.", "What is the difference between a process and a thread?", "What is a deadlock?",
    "How does a hash map handle collisions?", "What is memoization?", "What is unit testing and why does it matter?",
    "Explain what a Docker container is.", "What is the difference between == and === in JavaScript?",
    "How do I create a virtual environment in Python?", "What is a lambda function?", "Explain async and await.",
    "What is an index in a database?", "What does a compiler do?", "What is object-oriented programming?",
    "Explain how HTTPS works.", "What is a regular expression? Give an example.", "What is a binary tree?",
]
TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "the stock market", "climate change", "volcanoes",
    "the human heart", "democracy", "the Roman Empire", "vaccines", "the internet", "electric cars", "honey bees",
    "the moon landing", "rainbows", "earthquakes", "the immune system", "coffee", "chess", "the Renaissance",
    "solar panels", "the Great Wall of China", "DNA", "inflation", "meditation", "the Amazon rainforest",
    "gravity", "the printing press", "dinosaurs", "the Olympic Games", "tea", "the piano", "recycling",
    "artificial intelligence", "the ocean tides", "bread baking", "the water cycle", "photography", "jazz",
    "the Industrial Revolution", "antibiotics", "the solar system", "glaciers", "the Silk Road", "cats", "dogs",
    "mountains", "deserts", "the brain", "sleep", "exercise", "nutrition", "friendship", "time management",
    "public speaking", "learning a language", "gardening", "camping", "budgeting", "the Eiffel Tower",
    "the pyramids of Egypt", "coral reefs", "hurricanes", "the Moon", "Mars", "electricity", "magnets",
    "the telephone", "airplanes", "trains", "bicycles", "pizza", "chocolate", "the violin", "poetry",
    "Shakespeare", "the Nile", "penguins", "elephants", "owls", "butterflies", "the Arctic", "rain",
    "snow", "lightning", "the seasons", "vitamins", "stress", "happiness", "cooking pasta", "board games",
]
CHAT_TEMPLATES = [
    "Explain {topic} in simple terms.", "What is {topic}?", "Tell me three interesting facts about {topic}.",
    "Write a short poem about {topic}.", "Describe {topic} to a child.", "Why is {topic} important?",
    "Give me a brief summary of {topic}.", "What are the pros and cons of {topic}?",
    "Write a short paragraph about {topic}.", "How would you explain {topic} to a friend?",
    "Write a limerick about {topic}.", "What should everyone know about {topic}?",
    "Give me five tips about {topic}.", "Write a short story that involves {topic}.",
    "What is the history of {topic}?", "Can you help me understand {topic}?",
    "Compare {topic} and {other}.", "Write a tweet about {topic}.", "What are common myths about {topic}?",
    "Write a friendly email to a colleague about {topic}.",
]
CHAT_MISC = [
    "How can I be more productive in the morning?", "What is a good way to start learning to cook?",
    "Suggest a weekend plan for a family with two kids.", "How do I write a good cover letter?",
    "What are some healthy breakfast ideas?", "How do I stay motivated when studying?",
    "Recommend three books for a long flight and say why.", "How can I improve my handwriting?",
    "What should I pack for a beach holiday?", "How do I apologise to a friend?", "Plan a three-day trip to Rome.",
    "What are good questions to ask in a job interview?", "How do I keep houseplants alive?",
    "Give me a simple workout I can do at home.", "How do I make a cup of good tea?",
    "What is the best way to save money each month?", "Write a thank-you note to a teacher.",
    "How can I sleep better?", "How do I make new friends in a new city?", "Write a birthday message for my sister.",
    "What are some fun things to do on a rainy day?", "How do I prepare for a marathon?",
    "Give me a recipe for pancakes.", "How do I introduce myself at a meeting?", "Name five famous painters.",
    "Write a motivational quote and explain it.", "Translate 'good morning, how are you?' into Spanish and French.",
    "What is the meaning of the word 'serendipity'?", "Hello! Who are you?", "Tell me a joke.",
]
MATH_TEMPLATES = [
    lambda r: f"Solve for x: {r.randint(2, 12)}x + {r.randint(1, 30)} = {r.randint(31, 120)}.",
    lambda r: f"Solve for x: {r.randint(2, 9)}x - {r.randint(1, 20)} = {r.randint(5, 80)}. Show your work.",
    lambda r: f"What is {r.randint(12, 99)} times {r.randint(3, 40)}?",
    lambda r: f"What is {r.randint(100, 999)} plus {r.randint(100, 999)}?",
    lambda r: f"What is {r.randint(5, 60)}% of {r.randint(20, 800)}?",
    lambda r: f"What is the derivative of {r.randint(2, 9)}x^{r.randint(2, 5)} + {r.randint(1, 9)}x?",
    lambda r: f"What is the integral of {r.randint(2, 9)}x^{r.randint(1, 4)}?",
    lambda r: f"A rectangle is {r.randint(2, 30)} cm long and {r.randint(2, 30)} cm wide. What are its area and perimeter?",
    lambda r: f"A circle has a radius of {r.randint(1, 20)} m. What is its area?",
    lambda r: f"If a car drives {r.randint(30, 400)} km in {r.randint(1, 6)} hours, what is its average speed?",
    lambda r: f"Tom has {r.randint(5, 50)} apples and gives away {r.randint(1, 5)}. How many are left?",
    lambda r: f"A book costs ${r.randint(5, 40)} and is on sale for {r.choice([10, 15, 20, 25, 30, 50])}% off. What is the sale price?",
    lambda r: f"What is the square root of {r.choice([16, 25, 36, 49, 64, 81, 100, 121, 144, 169, 196, 225])}?",
    lambda r: f"Simplify the fraction {r.randint(2, 12) * 6}/{r.randint(2, 12) * 6}.",
    lambda r: f"What is {r.randint(1, 9)}/{r.randint(2, 9)} plus {r.randint(1, 9)}/{r.randint(2, 9)}?",
    lambda r: f"Find the average of {', '.join(str(r.randint(1, 100)) for _ in range(r.randint(3, 6)))}.",
    lambda r: f"Is {r.randint(20, 300)} a prime number? Explain.",
    lambda r: f"Convert {r.randint(1, 200)} kilometres to miles.",
    lambda r: f"A train leaves at {r.randint(1, 11)}:00 and travels for {r.randint(2, 9)} hours. When does it arrive?",
    lambda r: f"What is {r.randint(2, 9)} to the power of {r.randint(2, 5)}?",
    lambda r: f"Solve the system: x + y = {r.randint(5, 30)}, x - y = {r.randint(1, 5)}.",
    lambda r: f"Expand ({r.randint(1, 9)}x + {r.randint(1, 9)})({r.randint(1, 9)}x - {r.randint(1, 9)}).",
    lambda r: f"What is the least common multiple of {r.randint(2, 20)} and {r.randint(2, 20)}?",
    lambda r: f"A recipe needs {r.randint(2, 5)} eggs for {r.randint(2, 6)} people. How many eggs for {r.randint(7, 20)} people?",
    lambda r: f"What is the probability of rolling a {r.randint(1, 6)} on a fair die twice in a row?",
    lambda r: f"Explain how to compute {r.randint(10, 99)} squared in your head.",
]


# A second vocabulary of subjects and phrasings (added for the second draft, so its data is not the first draft's
# few hundred templates answered again).
TOPICS += [
    "the printing of money", "quantum computing", "plate tectonics", "the Cold War", "wind turbines", "octopuses",
    "the Pythagorean theorem", "supply and demand", "the theory of evolution", "the Beatles", "origami", "yoga",
    "the Mona Lisa", "nuclear power", "the periodic table", "credit cards", "social media", "video games",
    "the Titanic", "ancient Greece", "the metric system", "opera", "sushi", "wolves", "whales", "tornadoes",
    "the ozone layer", "batteries", "3D printing", "the Vikings", "Mount Everest", "the Sahara", "the Great Barrier Reef",
    "blockchain", "machine learning", "cloud computing", "the English language", "mathematics", "philosophy",
    "minimalism", "remote work", "urban farming", "composting", "first aid", "dental hygiene", "the speed of light",
    "telescopes", "microscopes", "bacteria", "fungi", "forests", "rivers", "bridges", "skyscrapers", "castles",
]
CODE_TASKS += [
    "counts how often each word occurs in a file", "finds the longest common prefix of a list of strings",
    "checks whether a binary tree is balanced", "implements an LRU cache", "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral", "finds two numbers in a list that add up to a target",
    "validates a Sudoku board", "computes the n-th row of Pascal's triangle", "merges overlapping intervals",
    "returns the k largest elements of a list", "detects a cycle in a linked list", "encodes a string with run-length encoding",
    "computes the moving average of a list", "parses a date string and prints the weekday",
    "implements a simple calculator for + - * /", "generates a random password", "checks whether a number is a power of two",
    "counts the set bits of an integer", "finds the longest increasing subsequence", "implements a min-heap",
    "implements Dijkstra's shortest path algorithm", "splits a list into chunks of size n", "zips two lists into a dictionary",
    "reads command-line arguments and prints them", "retries a function call up to three times", "memoizes a function",
    "writes a list of dictionaries to a CSV file", "computes the Hamming distance of two strings", "checks whether a graph is bipartite",
]
CODE_TEMPLATES += [
    "Can you write {lang} code that {task}?", "Write a {lang} function that {task}, and add a test for it.",
    "I need a {lang} function that {task}. Please explain each step.", "Give an example in {lang} of a function that {task}.",
    "Write an efficient {lang} function that {task} and state its time complexity.",
]
CODE_QUESTIONS += [
    "What is the difference between a stack and a queue?", "How do I sort a dictionary by value in Python?",
    "What is a virtual function in C++?", "Explain what an API is.", "What is the difference between SQL and NoSQL databases?",
    "How does a for loop work in Python?", "What is type inference?", "What is a mutex?", "Explain the map function.",
    "What is the difference between a compiler and an interpreter?", "What is recursion depth and why does it matter?",
    "How do I merge two dictionaries in Python?", "What is a segmentation fault?", "Explain what JSON is.",
    "What is continuous integration?", "How do I make an HTTP request in JavaScript?", "What does 'git stash' do?",
]
CHAT_TEMPLATES += [
    "Write a short speech about {topic}.", "List the key facts about {topic}.", "What would happen without {topic}?",
    "Explain {topic} in three sentences.", "Write a haiku about {topic}.", "What are the main ideas behind {topic}?",
    "Give me a fun fact about {topic} and explain it.", "How has {topic} changed over time?",
    "Write a dialogue between two friends about {topic}.", "Describe {topic} in one paragraph.",
    "What questions do people often ask about {topic}?", "Write a product description inspired by {topic}.",
    "Explain the connection between {topic} and {other}.", "Teach me something surprising about {topic}.",
]
CHAT_MISC += [
    "How do I change a flat tyre?", "What should I cook for dinner tonight?", "Give me ideas for a birthday party.",
    "How do I write a good essay introduction?", "What are the benefits of reading every day?",
    "How do I ask my manager for a raise?", "Suggest five names for a pet cat.", "How do I calm down before an exam?",
    "Write a short welcome message for new team members.", "What are good habits for a healthy life?",
    "How can I learn to play the guitar?", "Write a polite email declining an invitation.", "What is a good stretching routine?",
    "Summarise the plot of Romeo and Juliet.", "What are the rules of chess in brief?", "Plan a healthy week of lunches.",
    "How do I start a vegetable garden?", "Write a short review of an imaginary restaurant.", "What is the Internet of Things?",
    "Give me a checklist for moving house.", "How do I take better photos with my phone?", "What is the golden ratio?",
]
MATH_TEMPLATES += [
    lambda r: f"What is {r.randint(100, 999)} minus {r.randint(10, 99)}?",
    lambda r: f"What is {r.randint(100, 999)} divided by {r.randint(2, 9)}? Give the remainder too.",
    lambda r: f"A triangle has sides {r.randint(3, 9)}, {r.randint(3, 9)} and {r.randint(3, 9)} cm. What is its perimeter?",
    lambda r: f"Sara saves ${r.randint(5, 50)} a week. How much does she save in {r.randint(3, 52)} weeks?",
    lambda r: f"What is {r.randint(2, 20)} factorial divided by {r.randint(2, 9)} factorial?",
    lambda r: f"Round {r.randint(1000, 99999) / 100} to the nearest whole number and explain.",
    lambda r: f"Solve the quadratic x^2 - {r.randint(2, 12)}x + {r.randint(1, 30)} = 0.",
    lambda r: f"A pizza is cut into {r.randint(6, 12)} slices and {r.randint(1, 5)} are eaten. What fraction is left?",
    lambda r: f"What is the area of a triangle with base {r.randint(2, 30)} and height {r.randint(2, 30)}?",
    lambda r: f"Convert {r.randint(1, 100)} degrees Fahrenheit to Celsius.",
    lambda r: f"What is the sum of the first {r.randint(5, 100)} positive integers?",
    lambda r: f"If {r.randint(2, 9)} workers build a wall in {r.randint(2, 12)} days, how long do {r.randint(10, 20)} workers take?",
    lambda r: f"What is {r.randint(1, 99)}.{r.randint(1, 9)} times {r.randint(2, 12)}?",
    lambda r: f"Find the mean and median of {', '.join(str(r.randint(1, 50)) for _ in range(r.randint(4, 7)))}.",
]


def training_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` (kind, prompt) pairs: a third code, a little over a third chat, the rest math; no duplicates."""
    rng = random.Random(seed)
    held_out = set(PROMPTS)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    kinds = ["code"] * 33 + ["chat"] * 40 + ["math"] * 27
    attempts = 0
    while len(out) < n and attempts < 50 * n:
        attempts += 1
        kind = rng.choice(kinds)
        if kind == "code":
            if rng.random() < 0.75:
                text = rng.choice(CODE_TEMPLATES).format(lang=rng.choice(LANGS), task=rng.choice(CODE_TASKS))
            else:
                text = rng.choice(CODE_QUESTIONS)
        elif kind == "chat":
            if rng.random() < 0.8:
                topic, other = rng.sample(TOPICS, 2)
                text = rng.choice(CHAT_TEMPLATES).format(topic=topic, other=other)
            else:
                text = rng.choice(CHAT_MISC)
        else:
            text = rng.choice(MATH_TEMPLATES)(rng)
        if text in held_out or text in seen:
            continue
        seen.add(text)
        out.append((kind, text))
    return out
