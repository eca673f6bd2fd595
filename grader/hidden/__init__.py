"""Hidden tests, one module per chapter (``ch01_lora.py`` ...). Judge-side only."""
