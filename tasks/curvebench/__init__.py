"""curvebench task family (work in progress; registers nothing yet)."""
