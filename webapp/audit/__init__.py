"""The operators' audit log and the request context every log line and audit event carries."""
