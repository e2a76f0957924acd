"""spatial_ssrl task family (work in progress; registers nothing yet)."""
