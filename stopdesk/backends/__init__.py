"""Django database backends of stopdesk's own (`ENGINE`)."""
