"""The command-line interface; imports the core, never the other way round."""
