"""Language models: loading (tiny, Hugging Face, GGUF, LoRA), prompts and sampling engines."""
