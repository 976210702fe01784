"""ticks"""
