"""Sampling options that leave a chain neutral but for what a test sets:
no penalties, no mirostat, no typical/min/top-p cut."""

NEUTRAL = {
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repeat_last_n": 64,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "typical_p": 1.0,
    "min_p": 0.0,
    "top_p": 1.0,
}
