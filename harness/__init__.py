"""specsoak: measure whether speculative decoding is worth it on your hardware, engine and traffic."""

__version__ = "0.1.0"
