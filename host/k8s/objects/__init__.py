"""The Kubernetes objects of docs/kubernetes.md as plain data, built in one place so no two parts disagree."""
