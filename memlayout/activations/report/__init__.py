"""The activations reports: the terminal table and the JSON (schema 1) of one device, of ranks and of `--fit`. Never
printed here."""
