"""Dashboard views: they parse input and check access; tenants and speech services change state."""
