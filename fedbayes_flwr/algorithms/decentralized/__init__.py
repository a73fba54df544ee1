"""Building blocks of decentralized algorithms: communication graphs, gossip mixing matrices and
schedules, and the routing of neighbours' messages through the star of a Flower server.
"""
