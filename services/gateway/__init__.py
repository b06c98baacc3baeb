"""The gateway service: the HTTP publish API and the CoAP gateway (docs/gateway.md)."""
