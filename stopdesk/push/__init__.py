"""Stop, pushed to whoever waits for it: the process's one listener (`hub.StopHub`, a thread and a
LISTEN connection, fanning each stop out to the watchers in the process) and the long-poll watch
endpoint served from it (`watch`, a plain ASGI handler and its Django twin). The notification
itself is the stop service's (`stopdesk.services.stop_notify`)."""
