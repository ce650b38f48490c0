"""One module per `lookupspec` sub-command: configure(parser) and run(args)."""
