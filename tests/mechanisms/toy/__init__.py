"""A toy mechanism, added the documented way: one folder and one `folders.add` (a line in FOLDERS)."""
