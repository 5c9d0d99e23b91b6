//! The library's tests beyond the conformance suite, one module an engine
//! (its foreign clients, its own faults, its URL options), in one test
//! binary so that the suite links once.

mod curator;
mod etcd;
mod examples;
mod mariadb;
mod multilock;
mod postgres;
mod redis;
mod sqlite;
mod tls;
mod zookeeper;
