"""Tenancy and request signing: accounts and HMAC-SHA256 signatures (``accounts``), the
gate an actor checks a signed request at (``gate``) and the durable replay window
(``nonces``)."""
