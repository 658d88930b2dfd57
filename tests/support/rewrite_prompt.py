"""An input-grounded prompt for Gemma: rewrite a given function with one
change. Most of the answer quotes the prompt, so drafts are mostly accepted
(the speculative decoding tests with prompt lookup and with a draft model)."""

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over a window."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result
'''

ASK = "Rewrite this function, renaming `values` to `series`. Reply with code only.\n\n"
REWRITE_PROMPT = f"<start_of_turn>user\n{ASK}{CODE}<end_of_turn>\n<start_of_turn>model\n"

PASSAGES = (
    "The old mill by the river ground wheat for the village until the railway came. "
    "After that the miller's children turned it into a bakery, and on market days the "
    "queue for their rye bread reached the bridge before the church bells rang eight.",
    "Glaciers move because ice under its own weight flows like a very thick liquid. "
    "Where the valley narrows the ice speeds up and cracks open into crevasses, and where "
    "it widens again the cracks close, leaving long blue scars across the surface.",
    "A spreadsheet keeps numbers in a grid of cells, and each cell may hold a formula "
    "that refers to others. When one value changes, the program works out which formulas "
    "depend on it and recomputes them in order, so the totals are always current.",
)
# long enough that prompt and answer pass 256 cells, where llama.cpp's cache
# view reaches 512 and its CPU flash attention splits a single query's cells
QUOTE_PROMPT = (
    "<start_of_turn>user\nHere are three passages.\n\n"
    + "\n\n".join(f"Passage {i + 1}: {p}" for i, p in enumerate(PASSAGES))
    + "\n\nQuote passages 1, 2 and 3 back word for word, each on its own line."
    + "<end_of_turn>\n<start_of_turn>model\n"
)
