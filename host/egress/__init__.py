"""The egress path: what a sandbox may reach on the network, through the host, checked byte by byte."""
