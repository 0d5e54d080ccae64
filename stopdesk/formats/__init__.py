"""Display formats that replace the locale's where an audit needs more (FORMAT_MODULE_PATH)."""
