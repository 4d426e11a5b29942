"""Load generation. ``locustfile.py`` is the only module that imports locust, and it runs in its
own process (locust monkey-patches the interpreter with gevent); the harness drives it from
``locust_proc.py`` through the command line and reads back the records it writes."""
