"""The developer's and the demo's world, on top of the product packages: the drills and `manage.py
stopdrill`, the sandbox parties (`python -m stopdrill.sandbox`), the demo agent and `manage.py up`
(what `make run` calls). Nothing in `stopdesk` or `reconcile` imports it."""
