"""Reading server logs: start-up pool lines (startup.py) and failure signatures."""
