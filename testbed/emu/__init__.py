"""Emulation: the topology spec built as real namespaces, veths, bridges, HTB and a delay line.

`emu` never decides a schedule; it builds the network a plan runs on and tears it down.
"""
