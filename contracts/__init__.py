"""contracts: the formats, settings and rules every package shares (numpy only; imports none of ours)."""
