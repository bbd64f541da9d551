"""worldgen: a compact LingBot-World (Wan2.2-I2V-A14B + camera control) inference engine.

Knows nothing of ZeroMQ or Isaac Sim. Importing the package is cheap; torch is imported by the
modules that need it.
"""
