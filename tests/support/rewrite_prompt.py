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
