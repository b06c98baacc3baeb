"""The authenticators a tenant's chain is made of (settings `auth_chain`), one per module:
password hashes, JWT, an HTTP auth service, client certificates; `chain` runs them in order.
SCRAM (MQTT 5 enhanced authentication) is not a link of the chain: services/session/enhanced.py.
"""
