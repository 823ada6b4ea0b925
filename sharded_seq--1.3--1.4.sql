/* sharded_seq--1.3--1.4.sql */

\echo Use "ALTER EXTENSION sharded_seq UPDATE TO '1.4'" to load this file. \quit
