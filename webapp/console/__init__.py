"""The operators' console: the admin site's model pages, the workers and operations pages.

It sits above every other package (it reads the speech, tenants, housekeeping and
metrics data and calls their services); nothing imports it.
"""
