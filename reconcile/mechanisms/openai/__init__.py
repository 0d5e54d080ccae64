"""OpenAI background responses: create, retrieve, cancel."""
