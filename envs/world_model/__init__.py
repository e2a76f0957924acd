"""world_model environments (work in progress; registers nothing yet)."""
