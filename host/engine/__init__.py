"""The container engine: Docker's and Podman's API, the hardened spec, the pinned image, seccomp, volumes."""
