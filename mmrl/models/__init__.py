"""Model builders for the embedded defaults (built from configs in assets/, never downloaded)."""
