"""The `podrace` commands (`train`, `eval`, `plot`) and the process supervision they need:
signals and the main thread (`supervisor`), the standard streams (`std_streams`), argument
parsing (`arguments`)."""
