"""devnet"""
