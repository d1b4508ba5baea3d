"""What runs the engines: session, the instrumented RL loop, run / sweep / consistency / fault runs, profiling."""
