"""The signed-in web dashboard: Django templates and a little plain JavaScript (docs/dashboard.md)."""
