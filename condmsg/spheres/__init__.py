"""Dependency-Spheres: the sender-side sphere, its participants and its store."""
