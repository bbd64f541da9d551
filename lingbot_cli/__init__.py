"""The one `lingbot-isaac` command: dispatches to the subcommands of each package."""
