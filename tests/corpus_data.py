"""Shared prompts for the backend tests: 20 chat prompts, each with a 64-token teacher-forced continuation."""

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in one paragraph.",
    "List three uses of a paperclip.",
    "How do I convert 10 miles to kilometers?",
    "Translate 'good morning' into Spanish and German.",
    "What does the Python function zip() do?",
    "Give me a short recipe for pancakes.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What is 17 times 23?",
    "Suggest a name for a pet turtle.",
    "What is the difference between TCP and UDP?",
    "Describe a sunset over the ocean.",
    "How many days are in a leap year?",
    "Write a SQL query that counts rows in a table named users.",
    "What are the primary colors?",
    "Explain recursion to a child.",
    "Call the weather tool for Paris with unit celsius.",
    "Find files named report.pdf in the documents folder.",
]

CONTINUATION = (
    "Sure! Here is a careful answer. First, consider the main idea and the key facts that matter. Then, look at "
    "an example: if we take 12 items and split them into 3 groups, each group has 4 items. Finally, remember "
    "that clear steps, checked twice, make the answer easy to follow and hard to get wrong."
)


def teacher_forced(tokenizer, prompt: str, n_positions: int = 64) -> tuple[list[int], int]:
    """(tokens, start): the chat prompt plus continuation; logits are compared at the last `n_positions` tokens."""
    ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
    cont = tokenizer.encode(CONTINUATION)[:n_positions]
    assert len(cont) == n_positions, len(cont)
    return ids + cont, len(ids)
