"""nxsat: an ahead-of-time graph compiler for AWS Neuron devices, built on equality saturation."""

__version__ = "0.1.0"
