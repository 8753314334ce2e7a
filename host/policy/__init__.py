"""Who may run what, how tightly: trust routing, effective limits (the host ceiling wins), admission."""
