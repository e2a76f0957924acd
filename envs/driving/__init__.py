"""driving environments (work in progress; registers nothing yet)."""
