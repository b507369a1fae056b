"""Mixed prompts (code, chat, math) shared by the engine tests and the benchmarks."""

KINDS = ("code", "chat", "math")

PROMPTS_BY_KIND: list[tuple[str, str]] = [
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("chat", "What is the capital of France, and what is it known for?"),
    ("math", "Solve for x: 3x + 7 = 22. Show your steps."),
    ("chat", "Explain what a hash table is in two sentences."),
    ("code", "Write a JavaScript function that sums an array of numbers."),
    ("chat", "Give me three tips for a good night's sleep."),
    ("math", "What is 48 divided by 6, plus 12?"),
    ("chat", "Write a haiku about the ocean."),
    ("code", "How do I reverse a linked list in C?"),
    ("chat", "What causes the seasons on Earth?"),
    ("math", "A shop sells apples at 3 for $2. How much do 12 apples cost?"),
    ("code", "Write a SQL query that finds the five most recent orders."),
    ("chat", "Describe the water cycle for a ten-year-old."),
    ("math", "What is the derivative of x^3 + 2x?"),
    ("code", "Write a Python class for a simple bank account with deposit and withdraw."),
    ("chat", "Suggest a name for a coffee shop and explain why."),
    ("math", "If a train travels 60 km in 45 minutes, what is its speed in km/h?"),
    ("code", "Write a bash one-liner that counts the lines in all .py files."),
    ("chat", "What are the main differences between TCP and UDP?"),
    ("chat", "Tell me a short story about a robot who learns to paint."),
]

PROMPTS = [p for _, p in PROMPTS_BY_KIND]
