"""Server-rendered pages: one view and one template per page; htmx requests get the named
partial of the element they target."""
