"""The wire contract: every message and stored record Mosaic exchanges, and every subject name.

Services encode and decode at their edges only; everything in between works on these Structs.
"""
