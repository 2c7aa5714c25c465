"""Plugins for the engines that run on accelkit devices (vLLM); each is inert unless an accelkit
backend is selected, and none is imported by ``import accelkit``."""
