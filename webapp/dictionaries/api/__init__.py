"""The REST API of pronunciation dictionaries (``/api/v1/dictionaries``)."""
