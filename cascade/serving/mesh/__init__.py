"""Who may talk to the pods' ports and how they are reached: mutual TLS and a shared token
(``security``), the certificates for local clusters and tests (``certs``), and an injected link
delay that makes a loopback cluster behave like one across a network (``delay``)."""
