"""Deployment: export and its verification, INT8, predict, and torch-free inference (infer.py).

Kept empty of imports: ``python -m project.extras.deploy.infer`` must run where torch is missing.
"""
