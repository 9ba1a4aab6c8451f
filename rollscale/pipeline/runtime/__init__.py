"""What runs the stages' work: the worker pool a sweep or profile submits to (workers.py) and the Prefect API
server a command starts for itself (server.py)."""
