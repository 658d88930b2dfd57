"""The request vocabulary, free of HTTP, and the bounds on it.

Options, messages, images, durations and the caller's identity as both APIs
read them from a body; ``limits`` holds every bound on what a request may
ask for, ``untrusted_json`` the bounded reading of a body, and ``errors`` one
error type per failure a user can see.
"""
